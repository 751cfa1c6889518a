"""How ranks run: the machinery behind `lesson_code.launch`, which every lesson calls.

    devices.py      which backend and device each rank uses (gloo on CPUs, NCCL on GPUs)
    fork_server.py  how a rank starts: the course's own fork server, its life, and the
                    environment each rank gets
    server_imports.py  what the fork server imports when it starts (imported there only)
    processes.py    the rank processes: their body, watched, collected, stopped
    errors.py       what `launch.spawn` raises when a run does not complete
    output.py       what each rank prints, captured and shown to the caller
    validate.py     argument checks that name the value and the fix (the lessons' too)

Standard library and torch only.
"""
