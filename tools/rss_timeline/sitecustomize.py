"""Where a process's resident memory peaks: a sampler thread in every Python process started
with this folder on ``PYTHONPATH`` and ``RSS_TRACE`` set (child processes inherit both).

    PYTHONPATH=tools/rss_timeline:$PYTHONPATH RSS_TRACE=/tmp/rss \\
        python tools/bench_devices.py --processes 2 --out-of-core

Every 20 ms it reads the process's resident memory (``VmRSS``); at the highest it keeps the
main thread's stack (its frames in jgrind and the tools), and once a second it notes the time,
the resident GiB and the innermost three such frames. At exit it writes them as JSON to
``$RSS_TRACE.<pid>``: ``argv``, ``max_gib``, ``stack`` (at the peak) and ``timeline``. A peak
shorter than 20 ms can be missed. Python runs ``sitecustomize`` at start-up by itself; without
``RSS_TRACE`` this does nothing.
"""

import atexit
import json
import os
import sys
import threading
import time

_OUT = os.environ.get("RSS_TRACE")


def _resident() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) * 1024
    return 0


def _stack(main: threading.Thread) -> list:
    frame = sys._current_frames().get(main.ident)
    out = []
    while frame is not None:
        code = frame.f_code
        if "jgrind" in code.co_filename or "tools" in code.co_filename:
            out.append(f"{os.path.basename(code.co_filename)}:{frame.f_lineno}:{code.co_name}")
        frame = frame.f_back
    return out[::-1]


def _start(path: str) -> None:
    main = threading.main_thread()
    state = {"max": 0, "stack": None, "timeline": []}

    def sample() -> None:
        start = last = time.time()
        while True:
            resident = _resident()
            if resident > state["max"]:
                state["max"], state["stack"] = resident, _stack(main)
            now = time.time()
            if now - last >= 1.0:
                state["timeline"].append((round(now - start, 1), round(resident / 2**30, 3),
                                          _stack(main)[-3:]))
                last = now
            time.sleep(0.02)

    def write() -> None:
        with open(f"{path}.{os.getpid()}", "w") as f:
            json.dump({"argv": sys.argv, "max_gib": state["max"] / 2**30,
                       "stack": state["stack"], "timeline": state["timeline"]}, f)

    threading.Thread(target=sample, name="rss-timeline", daemon=True).start()
    atexit.register(write)


if _OUT:
    _start(_OUT)
