"""``ringcomm demo``: the ring drawn step by step, the algorithms side by side,
and the ZeRO memory table measured (``demo``, ``algorithms``, ``zero_demo``)."""
