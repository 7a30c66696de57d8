"""``fusion="auto"``: measure each fusion against ORT on this machine and keep the winners.

    tuner      the entry point (``tune``), the decisions' cache and the table ``ortfuse tune`` prints
    measure    cutting matches into subgraphs and timing them against stock ORT
    decisions  the verdicts, the whole-model check and the ``fuse(keep=...)`` rule they make
"""
