"""The sandbox's service defaults, each written once: the commands, the Redis backend and worker
node, the client and the pool read them here (a call's own limits are ``Limits``'s, request.py).
Kept apart from the modules that use them so that ``rstar2 sandbox --help`` shows them without
importing redis or httpx."""

PORT = 8088  # `rstar2 sandbox serve` listens here, and the client calls here unless told a URL
DEADLINE_S = 600.0  # Redis mode: a call without a result this long after it was sent fails
LEASE_S = 60.0  # Redis mode: a task a silent worker node holds this long is handed to another
# stateful sessions, on each worker: the most alive at once (the least recently used goes), and
# how long one may sit unused before it is closed
SESSIONS_PER_WORKER = 64
SESSION_IDLE_S = 600.0
