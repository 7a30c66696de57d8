"""``fusion="auto"``: measure each fusion against ORT on this machine and keep the winners.

    tuner           the entry point (``tune``), the decisions' cache and the table ``ortfuse tune`` prints
    measure         the whole plan first, else cutting matches into subgraphs, timed against stock ORT
    decisions       the verdicts, the whole-model check and the ``fuse(keep=...)`` rule they make
    lookup          whether decisions may exist for a model, from its serialized bytes (no onnx)
    judge           whether a timed plan beats stock ORT beyond the noise of the same timing
    plan_choice     which of several candidate whole-model plans is kept, from one timing of all of them
    layout_memo     the layout step run once per fused model in a tuning
    steps           where a tuning's time goes: named steps recorded by the code that does them
    output_check    fused outputs against stock ORT's, and the tolerances of every such check
    rank_kernels    measuring the kernel ranking in the whole model (``ortfuse rank``; stored by kernel_choice.ranking)
    kernel_compile  the native kernels a plan needs, compiled in a child process that can be stopped
"""
