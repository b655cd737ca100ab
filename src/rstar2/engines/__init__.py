"""Inference engines behind one protocol (``base.py``): token ids in, token ids and logprobs out."""
