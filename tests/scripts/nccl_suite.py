"""One rank of the shared suite over the NCCL transport (run under mpirun by
tests/test_cuda.py): cupy arrays on this rank's GPU; prints OK or the failures."""
import os
import sys

_tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _tests)  # suite.py, test_cuda.py
# An in-place build (python setup.py build_ext --inplace) is importable from
# the checkout root, which is not on the path of a script in tests/scripts;
# appended, so an installed ringcomm still wins.
sys.path.append(os.path.dirname(_tests))

import suite  # noqa: E402
from test_cuda import CupyArrays  # noqa: E402

import ringcomm  # noqa: E402

if os.environ.get("RINGCOMM_IMPORT_ONLY"):  # tests/test_cuda_build.py: the imports above resolve
    print(f"imports OK: ringcomm from {os.path.dirname(ringcomm.__file__)}")
    sys.exit(0)

comm = ringcomm.init(device="cuda", timeout=60)  # also makes this rank's GPU current
import cupy  # noqa: E402

assert cupy.cuda.Device().id == int(comm.device.split(":")[1])
n = comm.size
errs = suite.run_cases(comm, [0, 1, n + 1, 1000, 100003], arrays=CupyArrays)
comm.segment_bytes = 16
errs += suite.run_cases(comm, [7 * n + 3], [("float32", "sum"), ("int64", "prod"), ("float16", "avg")],
                        arrays=CupyArrays)
errs += suite.run_broadcasts(comm, [0, 1, 7 * n + 5], ["float32", "int8"], arrays=CupyArrays)
errs += suite.run_barrier(comm)
print(f"rank {comm.rank} on {comm.device}: " + ("OK" if not errs else "\n".join(errs[:20])), flush=True)
comm.close()
sys.exit(1 if errs else 0)
