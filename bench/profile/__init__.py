"""`bench profile` and `bench bandwidth`: an xprof trace of N decode steps, where device time goes, the roofline.

No jax at import time: the capture and the bandwidth measurement import it when they run.
- `capture_steps`, `prompt_decode_steps`, GPU profile flags  (bench.profile.capture)
- `analyze_trace`, `ProfileAnalysis`, `format_profile_table` (bench.profile.analysis: the device-time breakdown)
- `classify_hlo`, `classify_name`, `is_tensor_core_kernel`    (bench.profile.classify: one op's category)
- `hlo_modules`, `event_metadata_stats`                       (bench.profile.xspace: HLO and op stats from an XSpace)
- `bytes_from_hlo`, `parameter_rewrite`, `parse_instruction_text`
                                          (bench.profile.hloops: one op's HLO text, bytes moved, parameter rewrites)
- `profile_findings`, `format_finding`, `OP_BYTES_SHARE`, `PARAM_MIN_SHARE`
                                          (bench.profile.findings: the rules that name an op worth a look)
- `measure_bandwidth`, `measure_read_bandwidth`, `measure_stream_read`, `measure_read_probes`, `BandwidthResult`
                  (bench.profile.bandwidth: device-to-device copy; XLA's read-only pass; the Pallas streaming read,
                   bench.profile.stream; the probes a platform has, whose fastest is the ceiling's measured read)
- `measure_matmul_rate`, `MatmulRateResult`                  (bench.profile.matmul: matrix-product FLOP/s)
- `decode_step_bytes`, `roofline_share_pct`                   (bench.profile.roofline: bytes per step, share)
"""

from bench.profile.analysis import ProfileAnalysis, analyze_trace, format_profile_table
from bench.profile.bandwidth import (
    BandwidthResult,
    measure_bandwidth,
    measure_read_bandwidth,
    measure_read_probes,
    measure_stream_read,
)
from bench.profile.capture import capture_steps, prompt_decode_steps
from bench.profile.findings import OP_BYTES_SHARE, PARAM_MIN_SHARE, format_finding, profile_findings
from bench.profile.hloops import bytes_from_hlo, parameter_rewrite, parse_instruction_text
from bench.profile.matmul import MatmulRateResult, measure_matmul_rate
from bench.profile.roofline import decode_step_bytes, roofline_share_pct
from bench.profile.xspace import event_metadata_stats, hlo_modules

__all__ = ["ProfileAnalysis", "analyze_trace", "format_profile_table", "BandwidthResult", "measure_bandwidth",
           "measure_read_bandwidth", "measure_read_probes", "measure_stream_read", "MatmulRateResult",
           "measure_matmul_rate", "capture_steps", "prompt_decode_steps", "decode_step_bytes", "roofline_share_pct",
           "hlo_modules", "event_metadata_stats", "bytes_from_hlo", "parameter_rewrite", "parse_instruction_text",
           "OP_BYTES_SHARE", "PARAM_MIN_SHARE", "format_finding", "profile_findings"]  # fmt: skip
