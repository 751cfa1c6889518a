"""How ranks run: the machinery behind `lesson_code.launch`, which every lesson calls.

    devices.py      which backend and device each rank uses (gloo on CPUs, NCCL on GPUs)
    processes.py    the rank processes: started from a fork server, watched, stopped
    fork_server.py  the fork server kept in step with edited code
    server_imports.py  what the fork server imports when it starts (imported there only)
    errors.py       what `launch.spawn` raises when a run does not complete
    output.py       what each rank prints, captured and shown to the caller

Standard library and torch only.
"""
