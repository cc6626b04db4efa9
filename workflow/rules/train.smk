# Recovery / continued training with the one shared trainer (resumes from its checkpoint).


rule train:
    input:
        model="results/{model}/{method}/{variant}/{setting}/compressed",
        text=GRID.train_text,
        validation=GRID.validation_text,
    output:
        model=directory("results/{model}/{method}/{variant}/{setting}/trained"),
    params:
        train=train_params,
        code=CODE_VERSION,
    log:
        "logs/{model}/{method}/{variant}/{setting}/train.log",
    benchmark:
        "benchmarks/{model}/{method}/{variant}/{setting}/train.tsv"
    threads: JOB_THREADS
    resources:
        mem_mb=12000,
        gpu=JOB_GPU,
    conda:
        "../../environment.yml"
    script:
        "../scripts/train.py"
