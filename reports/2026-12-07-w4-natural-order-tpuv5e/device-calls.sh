# The device calls of this report (device tool: carry [".whl-tpu"]), in order, 2026-12-07 late session.
# Call 1 (22:05-22:15 UTC), main e29d9f8 (the kernel that permuted its activations):
bash scripts/tpu-quant-archive.sh w4 policy tiling --loops host --budget-s 560
# (the tiling probe was skipped: 32 s left)
# Call 2 (22:16-22:21), e29d9f8 with scripts/tpu-quant-archive.sh's --kernel and profile:SET (commit e5ecf3d's script):
bash scripts/tpu-quant-archive.sh profile:w4 tiling --kernel w4a16=pallas:steps --budget-s 440
# Call 3 (22:31) was taken back by the device service before it finished: nothing came back.
# Call 4 (22:37-22:45), commit 3c58508 (the natural pair order):
bash scripts/tpu-quant-archive.sh w4 none profile:w4 policy1 w4,ple4,int8_lm_head --kernel w4a16=pallas:steps \
  --loops host --budget-s 540
# (w4,ple4,int8_lm_head skipped: 68 s left)
# Run folders were renamed from the script's tpu-quant-* names (the names collided across calls and with earlier
# runs): manifest "name" set to the new folder name, nothing else changed. The device's copy carried the session
# start's git metadata (e29d9f8), so calls 2 and 4 read "e29d9f8, dirty"; their build ids tell the builds apart
# (c8acf2abf349 / fe71f335a384 call 1 fewest / steps, 559d4ccc4dc5 / edd81a04443b call 4 steps / fewest).
