"""``python tests/ctrl_c_in_torch_import.py ARGS``: ``trunk ARGS`` with a Ctrl+C (a real SIGINT) raised as torch's C
extension imports numpy, which clears the KeyboardInterrupt and goes on loading: the moment a Ctrl+C is lost."""

import runpy
import signal
import sys


class CtrlCAsTorchImportsNumpy:
    def find_spec(self, name, path=None, target=None):
        if name == "numpy" and "torch" in sys.modules and "numpy" not in sys.modules:
            sys.meta_path.remove(self)
            signal.raise_signal(signal.SIGINT)
        return None  # the import itself goes on as usual


sys.meta_path.insert(0, CtrlCAsTorchImportsNumpy())
sys.argv = ["trunk", *sys.argv[1:]]
runpy.run_module("trunk.cli", run_name="__main__")
