"""var_layers.py N cli-args: adds the preset 'ds-r1-qwen-32b-<N>l', the 32B preset cut to its
first N layers (every layer's shapes as in the 32B; embedding and LM head whole), then runs
the CLI. A stand-in where the whole 32B and its KV do not fit the card."""
import dataclasses
import sys
from types import MappingProxyType

import hifc.loader
import hifc.models
import hifc.models.presets as P

n = int(sys.argv[1])
name = f"ds-r1-qwen-32b-{n}l"
presets = dict(P.PRESETS)
presets[name] = dataclasses.replace(presets["ds-r1-qwen-32b"], num_hidden_layers=n)
for module in (P, hifc.models, hifc.loader):
    module.PRESETS = MappingProxyType(presets)
print("preset", name, presets[name].num_hidden_layers, "layers", flush=True)
from hifc.entrypoints.cli import main  # noqa: E402

sys.exit(main(sys.argv[2:]))
