# Sourced by the GPU scripts that run in stages (gpu_paper_run.sh, gpu_speed_targets.sh).
# select_stages STAGE ...: sets `stages` to the stages named (every one of `all`, in its order,
# when none is), and exits with status 2 naming one that `all` does not hold, before anything
# runs.
select_stages() {
  stages=("$@")
  [ ${#stages[@]} -eq 0 ] && stages=("${all[@]}")
  local s
  for s in "${stages[@]}"; do
    [[ " ${all[*]} " == *" $s "* ]] || { echo "unknown stage '$s' (stages: ${all[*]})" >&2; exit 2; }
  done
}
