# Live and peak bytes per region from a remat trace (JSON Lines), the same numbers
# `remat-report memory TRACE --json` prints for a trace whose frees carry the size and tag of
# their allocation (as the allocator writes them): alloc adds its size to its region,
# free_requested subtracts it, and each region keeps its highest value.
# Run with: jq -n -c -f region_totals.jq TRACE
input as $h
| ($h.tags | map($h.names[.region] | if . == "" then "(untagged)" else . end)) as $region
| reduce inputs as $e ({live: {}, peak: {}};
    if $e.action == "alloc" then
      $region[$e.tag] as $r
      | .live[$r] += $e.size
      | if .live[$r] > (.peak[$r] // 0) then .peak[$r] = .live[$r] else . end
    elif $e.action == "free_requested" then
      .live[$region[$e.tag]] -= $e.size
    else . end)
| {live, peak}
