"""The dense reference's declaration (read by :mod:`flexigpt.storage.registry`)."""

from flexigpt.storage.method_facts import ALL_FAMILIES, MethodFacts

METHODS = {
    "dense": MethodFacts("flexigpt.methods.dense.method:METHOD", "Dense", calibration=False,
                         timed=True, families=ALL_FAMILIES, roles=("reference",), order=0),
}
