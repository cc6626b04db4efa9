# Recovery training with the one shared trainer: every point of the recipe's tuning grid in
# one job, as successive halving (flexigpt.runtime.training.tuning.run_sweep): each trial trains to
# the rung on the full schedule, the one with the lowest tuning-split perplexity there
# continues to the end and becomes the run's trained model (resumes after a kill).


rule train:
    input:
        unpack(train_inputs),
    output:
        model=directory("results/{model}/{method}/{variant}/{setting}/trained"),
    params:
        trials=train_trials,
        meta=select_meta,
        rung=GRID.tuning_rung,
        # the bracketing rule (None: the grid as it is), the rung check, the next-best LRs
        search=lambda wildcards: GRID.search(run_of(wildcards)),
        rung_check=lambda wildcards: GRID.rung_check(run_of(wildcards)),
        lr_next=lambda wildcards: run_of(wildcards).lr_next,
        teacher=trial_teacher,
        code=code_of("train"),
        processes=TRAIN_PROCESSES,
    log:
        "logs/{model}/{method}/{variant}/{setting}/train.log",
    benchmark:
        "logs/timings/{model}/{method}/{variant}/{setting}/train.tsv"
    priority: PRIORITY.of("train")
    threads: JOB_THREADS
    resources:
        mem_mb=12000,
        gpu=JOB_GPU,
    conda:
        "../envs/flexigpt.yaml"
    script:
        "../scripts/train.py"
