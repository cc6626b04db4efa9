# Compression (every registered method) and extension: one rule, the method is a wildcard.


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
        "benchmarks/{model}/{method}/{variant}/{setting}/compress.tsv"
    threads: JOB_THREADS
    resources:
        mem_mb=8000,
        gpu=JOB_GPU,
    conda:
        "../../environment.yml"
    script:
        "../scripts/compress.py"
