# Shared by the bench scripts (sourced, not run).

# Percent of the CPU time other processes used over 0.4 s (the caller runs nothing of its own
# meanwhile), for the load line each report prints.
others_busy() {
  local a b c d e f g h t1 i1 t2 i2
  read -r _ a b c d e f g h _ </proc/stat
  t1=$((a + b + c + d + e + f + g + h)) i1=$((d + e))
  sleep 0.4
  read -r _ a b c d e f g h _ </proc/stat
  t2=$((a + b + c + d + e + f + g + h)) i2=$((d + e))
  echo $((100 * ((t2 - t1) - (i2 - i1)) / (t2 - t1 > 0 ? t2 - t1 : 1)))
}
