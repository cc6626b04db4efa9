# flexigpt-bench: every method x ratio, the ablations and the extension, evaluated and tabulated.
#   snakemake --cores all                                   (embedded default, config/config.yaml)
#   snakemake --cores all --configfile config/smoke.yaml    (tiny CI run)
#   snakemake --cores all --configfile config/paper.yaml --workflow-profile workflow/profiles/slurm
from snakemake.utils import min_version

min_version("9.0")


# The embedded default only when no --configfile is given: a user's config is validated as
# written, never silently completed from the default's keys (and an empty config file is an
# error naming the file, not a request for the default).
from flexigpt.workflow.config_check import check_config_files

check_config_files(workflow.config_settings.configfiles)

if not config:

    configfile: "config/config.yaml"



include: "workflow/rules/common.smk"
include: "workflow/rules/resources.smk"
include: "workflow/rules/compress.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/report.smk"


rule all:
    default_target: True
    input:
        TABLES_DIR,
