"""Run at the start of every process the tests start (tests/conftest.py puts this folder first on PYTHONPATH).

torchmetrics, on import (and Lightning imports it), imports each optional package it finds installed: transformers,
scipy and matplotlib, which the dev extras install for the parity tests, the baselines and the figures. That is 3.5 s
of the 7-9 s a process spends starting on a 2-core Xeon, and the suite starts about 270 processes (`trunk` commands,
DDP and FSDP2 ranks, servers, benchmark scripts). Trunk uses none of those packages through torchmetrics or
Lightning, so their availability checks are told they are absent, as in an install of Trunk without the dev extras;
importing the packages directly (a benchmark's Trainer, Optuna's plots) works as before.
"""

try:
    import lightning_utilities.core.imports as _imports
except ImportError:  # a process started without the project's environment
    pass
else:
    from functools import lru_cache

    _NOT_USED_THROUGH_TORCHMETRICS = {"transformers", "scipy", "matplotlib"}
    _package_available = _imports.package_available
    _check_requirement = _imports.RequirementCache._check_requirement

    @lru_cache
    def package_available(package_name: str) -> bool:
        return package_name not in _NOT_USED_THROUGH_TORCHMETRICS and _package_available(package_name)

    def check_requirement(self) -> None:
        name = _imports.Requirement(self.requirement).name
        if name in _NOT_USED_THROUGH_TORCHMETRICS:
            self.available, self.message = False, f"{name} is not read through torchmetrics in the tests"
        else:
            _check_requirement(self)

    _imports.package_available = package_available
    _imports.RequirementCache._check_requirement = check_requirement
