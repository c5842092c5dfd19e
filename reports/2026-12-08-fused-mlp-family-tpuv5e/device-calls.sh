# The device calls of 2026-12-08 (device tool: carry [".whl-tpu"], timeout_s 600 unless said), in order.
# 1 (main fd3ecd6, 428 s): the tiling probe on the natural-order layout with the resident form, the expert-kernel
#   probe, the published pair with w4
bash scripts/tpu-quant-archive.sh tiling moe w4,ple4,int8_lm_head --loops host --budget-s 570
# 2 (main 3c9223a, 491 s): the fused MLP A/B (steps, fused, steps, fused), then fused on the device loop
bash scripts/tpu-quant-archive.sh policy:steps,fused w4 --loops device --kernel w4a16=pallas:fused --budget-s 560
# 3 (same warm machine, 134 s, timeout_s 200): a 20-step profile of w4 under the fused policy
bash scripts/tpu-quant-archive.sh profile:w4 --kernel w4a16=pallas:fused --budget-s 150
# 4 (main d88faa7, 292 s, timeout_s 460): the family step: 26B-A4B w4, E4B none and w8 at 41 tokens
bash scripts/tpu-quant-archive.sh family --budget-s 430
