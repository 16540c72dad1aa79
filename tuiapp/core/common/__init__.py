"""Small pieces every layer of core uses: errors, findings, JSON output, kinds of runs, built folders, child tools, secrets."""
