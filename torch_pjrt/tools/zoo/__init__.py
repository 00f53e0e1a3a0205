"""A sweep over Hugging Face transformers' architectures on pjrt.

    python -m torch_pjrt.tools.zoo --sample 20 --jobs 2
    python -m torch_pjrt.tools.zoo --only bert,gpt2,llama --modes strict,fused,compiled
    python -m torch_pjrt.tools.zoo --resume --results docs/zoo/results.jsonl --report docs/zoo.md

Every model type of the installed transformers that has an auto class is built from
a tiny random configuration (its config class's defaults, shrunk), run forward and
backward on the CPU in float32 and float64 and on pjrt, and each output and each
parameter gradient on pjrt is judged against float64 with the bound of
torch_pjrt.qualify.differential (a multiple of float32's own error plus a few ulps).

Modules: catalog (model types, the class run for each), shrink (the tiny config),
overrides (per-architecture data the generic rules cannot fit), inputs (forward
arguments from the signature and config), execute (forward + backward, outputs and
gradients), judge (the comparison and a mode's status), worker (one architecture in
a process: one JSON line per phase), pool (workers in parallel with a time limit),
results (the JSONL records), report (docs/zoo.md).
"""
