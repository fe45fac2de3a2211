"""How ``algorithm="auto"`` chooses: the alpha-beta-gamma cost model
(``costmodel``), the selection from measured or modelled times
(``selection``), and ``ringcomm tune``, which measures them on this machine
(``tune``)."""
