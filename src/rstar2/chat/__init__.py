"""The paper's chat format: prompt, tools, tool-call parsing, tool responses, and token-in/token-out
rendering through the tokenizer's own chat template."""
