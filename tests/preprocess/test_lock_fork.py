"""The output lock's marker and the forked job process (`workers.run_in_job_process`)."""

from __future__ import annotations

import fcntl
import os
import threading
import time

from melshards.preprocess.out_dir import lock


def test_a_fork_waits_for_the_heartbeat_to_let_go_of_the_flocked_marker(tmp_path):
    """A child forked while another thread held the marker flocked would share that open file and keep
    the flock: every later renewal of the lock would block until the child ended."""
    marker = lock.marker(str(tmp_path / lock.LOCK_FILE))
    marker.create(b"mine")
    inside = threading.Event()

    def renew():
        with marker._locked():
            inside.set()
            time.sleep(0.5)  # the fork below is asked for while this holds the flock

    beat = threading.Thread(target=renew)
    beat.start()
    inside.wait()
    pid = os.fork()
    if pid == 0:  # the child: is the marker's flock free of any file it shares with the parent?
        try:
            with open(marker.path, "rb") as f:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            os._exit(0)
        except BaseException:
            os._exit(1)
    beat.join()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the child was forked holding the marker's flock"
