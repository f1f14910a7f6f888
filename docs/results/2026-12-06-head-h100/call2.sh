# call 2: lines 1-17 of call1.sh (setup, run(), $A, $B, $Q, $E), then:
Q16="bench kernels --model random:ds-r1-qwen-32b --context 1024 --prefill-len 512 --steps 32 --batch-sizes 16 --kv-cache-gib 5.5"
run old_q16b old 60 $Q16
run new_q16b new 60 $Q16
run old_bb old 40 $B
run new_bb new 40 $B
