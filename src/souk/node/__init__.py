"""What every long-running part (worker, broker, proxy, catalog, `souk dev`) shares, below the
parts themselves: how it waits for a signal, how it repeats a task, its cluster secret's file."""
