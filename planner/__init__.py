"""The pure planner core: ``plan(batch, fleet_state) -> Plan`` with no I/O.

Modules:
    model      -- planning data types (jobs, GPU groups, fleet state, plans)
    evaluator  -- replays a plan exactly and scores it
    policies   -- named policies (fifo, min-evict, wspt, ...) behind one Protocol
"""
