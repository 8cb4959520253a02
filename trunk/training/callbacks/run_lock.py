"""One run per run folder: a ``trunk fit`` holds its ``version_N`` folder with a lock file that names its process and
host, so that two runs never write into one folder (interleaved ``metrics.csv``, each other's ``last.ckpt``).

A new run whose folder another live run holds takes the next version; a resume of a folder another live run holds is
refused, naming the holder. The lock is the kernel's (``flock``): it goes with the process however it ends, so a
killed run's folder is free for the next run at once, and two runs that start together cannot both take it. The file
only names the holder for the message (``trunk/core/locks.py``). Hand-written: Lightning picks ``version_N`` by
listing the folder, which two runs starting together both see empty."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import lightning as L

from trunk.core.locks import release, try_lock

LOCK_FILE = ".trunk.lock"


class RunFolderLock(L.Callback):
    """Hold the run's folder for the whole fit (on the first process; the others write where it says). ``resume``: the
    run continues the folder of the checkpoint it resumes, which it may not leave for another."""

    def __init__(self, resume: bool = False) -> None:
        self.resume, self.lock = resume, None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit" or trainer.global_rank != 0 or trainer.fast_dev_run:  # a dry run writes no folder
            return
        versioned = next((lg for lg in trainer.loggers if hasattr(lg, "_version") and hasattr(lg, "root_dir")), None)
        while True:
            folder = Path(versioned.log_dir if versioned is not None else trainer.default_root_dir)
            owner = try_lock(folder / LOCK_FILE)
            if owner is None:
                break
            if versioned is None or self.resume or not isinstance(versioned.version, int):
                raise FileExistsError(
                    f"The run folder '{folder}' is in use by process {owner['pid']} on {owner['host']} (since "
                    f"{owner['started']}): two runs writing into one folder would mix their metrics and "
                    "checkpoints. Wait for it to end, or give this run another trainer.default_root_dir.")
            versioned._version = versioned.version + 1  # a new run: the next version, as if it had started later
            versioned._experiment = None  # made for the folder it had: made again for this one
        self.lock = folder / LOCK_FILE
        # the lock is what makes a new run's folder "not empty" to Lightning's loggers: nothing of an earlier run's
        warnings.filterwarnings("ignore", message=rf"Experiment logs directory {re.escape(str(folder))} exists and is "
                                                  "not empty")

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.release()

    def release(self) -> None:
        if self.lock is not None:
            release(self.lock)
        self.lock = None
