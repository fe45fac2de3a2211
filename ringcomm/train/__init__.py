"""Training with ringcomm, framework-neutral (numpy arrays or torch tensors):
DDP-style bucketed gradient synchronisation (``GradBucketer``), parameter
broadcast and consistency checks, and ZeRO stages 1-3 (``ZeroOptimizer``,
also reachable as ``ringcomm.zero``). The PyTorch-specific parts live in
``ringcomm.torch``."""
