"""``rstar2 launch``: a config or a recipe run across nodes. The same roles on every road (a process a
node, ``node.py``, starting that node's services, engines and trainer), placed by SLURM, Ray or this
machine (``roads.py``), wired from one plan (``plan.py``) and checked before the first step."""
