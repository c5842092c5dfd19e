"""Errors a user can cause in the engine (bad checkpoint, bad config, prompt too long).

Library code raises these; only `bench.cli` turns them into one printed line and exit code 2.
Each message names the value received, the value expected and, where there is one, the fix.
"""


class ModelError(Exception):
    """Base class of every user-caused engine error; its message is one line meant for a person."""


class ConfigError(ModelError):
    """A `config.json` that is missing, malformed, of another model type, or asks for an unsupported feature."""


class CheckpointError(ModelError):
    """A checkpoint path, repo id or safetensors file that cannot be loaded as asked (names the tensor and shapes)."""


class TokenizerError(ModelError):
    """A missing or malformed `tokenizer.json` (or its config files), or a special token it lacks (no BOS; no
    turn markers, for chat)."""


class EngineError(ModelError):
    """A request the engine cannot serve as configured (e.g. a prompt longer than the maximum length)."""


class QuantError(ModelError):
    """A quantization option set (`--quant`) that names an unknown option, repeats one, or combines two that
    exclude each other (ple8 with ple4, w8 with w4)."""


class KernelError(ModelError):
    """A kernel choice the device cannot run (`--kernel w4a16=pallas` on CPU, below compute capability 8.0, or
    without w4 weights), or a kernel whose tiles do not fit the device's scratch memory (names the bytes needed,
    the limit, the largest term and a tiling that fits)."""


class MeshError(EngineError):
    """A device mesh (`--mesh tp=N,ep=N`, `model.sharding`) that is malformed, asks for more devices than there are,
    or does not divide the model's heads, KV heads, feed-forward width or vocabulary (names the numbers)."""


class OptionError(ModelError):
    """An engine option value that is malformed or out of range (`--dtype`, `--max-length`, `--buckets`,
    `--scale-dtype`, `--kernel`, `--backend`: `model.engine_config.EngineConfig.from_options`)."""
