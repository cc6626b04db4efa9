"""FlexiGPT's declarations, pruning and extension (read by :mod:`flexigpt.storage.registry`)."""

from flexigpt.storage.method_facts import ALL_FAMILIES, TINY_RATIO, Depth, MethodFacts
from flexigpt.storage.recipe_facts import RecipeFacts

#: FlexiGPT's recipe: the replacement/repeat blocks' adapters, γ at its own learning rate
#: (implemented in :mod:`flexigpt.methods.flexigpt.recipe`)
FLEXIGPT_RECIPE = RecipeFacts("flexigpt", 4e-3, "flexigpt.methods.flexigpt.recipe:RECIPE",
                              grid_keys=("lr", "gamma_lr"), own_lrs=("gamma_lr",), lora=True,
                              other_blocks=True)

METHODS = {
    "flexigpt": MethodFacts("flexigpt.methods.flexigpt.prune:METHOD", "FlexiGPT",
                            tiny_options=(*TINY_RATIO, ("rank", 4)),
                            block_influence=True, speculative=True, timed=True,
                            block_count="replace", start_stage=True, manifest_figures=True,
                            variant_labels=(("lora_all", "FlexiGPT + LoRA on unpruned blocks"),),
                            replacement="weight-shared block + LoRA", families=ALL_FAMILIES,
                            recipes=(FLEXIGPT_RECIPE,), roles=("subject",), order=70,
                            replay="flexigpt.methods.flexigpt.replay"),
    "flexigpt_extend": MethodFacts("flexigpt.methods.flexigpt.extend:METHOD", "FlexiGPT extension",
                                   tiny_options=(("layers", Depth(2)), ("rank", 4),
                                                 ("gamma_init", 0.5)),
                                   calibration=False, speculative=True, timed=True,
                                   families=ALL_FAMILIES, section="extension", roles=("extension",),
                                   order=80, replay="flexigpt.methods.flexigpt.replay"),
}
