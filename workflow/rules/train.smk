# Recovery training with the one shared trainer: one trial per point of the recipe's tuning
# grid (each resumes from its checkpoint), then the trial with the lowest tuning-split
# perplexity becomes the run's trained model.


rule train_trial:
    input:
        unpack(trial_inputs),
    output:
        model=temp(directory("results/{model}/{method}/{variant}/{setting}/sweep/{trial}/trained")),
    params:
        train=trial_params,
        trial=lambda wildcards: GRID.trial_info(run_of(wildcards), wildcards.trial),
        teacher=trial_teacher,
        code=CODE_VERSION,
    log:
        "logs/{model}/{method}/{variant}/{setting}/train_{trial}.log",
    benchmark:
        "benchmarks/{model}/{method}/{variant}/{setting}/train_{trial}.tsv"
    threads: JOB_THREADS
    resources:
        mem_mb=12000,
        gpu=JOB_GPU,
    conda:
        "../../environment.yml"
    script:
        "../scripts/train.py"


rule select_trial:
    input:
        unpack(select_inputs),
    output:
        model=directory("results/{model}/{method}/{variant}/{setting}/trained"),
    params:
        meta=select_meta,
        code=CODE_VERSION,
    log:
        "logs/{model}/{method}/{variant}/{setting}/select.log",
    conda:
        "../../environment.yml"
    script:
        "../scripts/select_trial.py"
