"""Rule miner, miner agents, failure clustering and dataset export."""
