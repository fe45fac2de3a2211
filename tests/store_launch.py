"""The environment of a process started without an MPI launcher (a launch
through a store, as torchrun's workers are): no Open MPI, PMIx or torchrun
variables, no singleton MPI warning, one OpenMP thread."""

import os


def clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMIX_", "PMI_", "PRTE_")) and k not in
           ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "RINGCOMM_TRANSPORT")}
    env.update({"OMP_NUM_THREADS": "1", "RINGCOMM_SINGLETON_OK": "1"})
    env.update({k: str(v) for k, v in extra.items()})
    return env
