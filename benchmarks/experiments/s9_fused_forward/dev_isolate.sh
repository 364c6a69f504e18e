export CUDA_LAUNCH_BLOCKING=1
S=benchmarks/experiments/s9_fused_forward/check_variant.py
for shape in 1x256x1x128 4x4096x16x128; do
 for cfg in 32,4,1 32,4,2 32,4,3 64,4,2 64,8,3 128,8,3; do
  timeout 120 python $S simple_gla $shape $cfg 2>&1 | tail -1
 done
done
timeout 60 python $S simple_gla 1x256x1x64 64,4,1 2>&1 | tail -1
timeout 60 python $S simple_gla 1x256x1x64 64,4,2 2>&1 | tail -1
timeout 60 python $S linear_attn 1x256x1x128 32,4,1 2>&1 | tail -1
