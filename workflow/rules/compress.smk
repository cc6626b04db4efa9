# Compression (every registered method) and extension: one rule, the method is a wildcard.
# Block Influence is computed once per model and read by every method that ranks blocks.


rule block_influence:
    input:
        unpack(model_input),
        text=GRID.calibration_text,
    output:
        "results/{model}/block_influence.json",
    params:
        model=lambda wildcards: GRID.model_path(wildcards.model),
        calibration=GRID.calibration,
        code=code_of("block_influence"),
    log:
        "logs/{model}/block_influence.log",
    benchmark:
        "logs/timings/{model}/block_influence.tsv"
    priority: PRIORITY.of("block_influence")
    threads: JOB_THREADS
    conda:
        "../envs/flexigpt.yaml"
    script:
        "../scripts/block_influence.py"


rule compress:
    input:
        unpack(compress_inputs),
    output:
        model=directory("results/{model}/{method}/{variant}/{setting}/compressed"),
    params:
        run=compress_params,
        model=lambda wildcards: GRID.model_path(wildcards.model),
        code=code_of("compress"),
    log:
        "logs/{model}/{method}/{variant}/{setting}/compress.log",
    benchmark:
        "logs/timings/{model}/{method}/{variant}/{setting}/compress.tsv"
    priority: PRIORITY.of("compress")
    threads: JOB_THREADS
    resources:
        mem_mb=8000,
        gpu=JOB_GPU,
    conda:
        "../envs/flexigpt.yaml"
    script:
        "../scripts/compress.py"
