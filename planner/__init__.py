"""The pure planner core: ``plan(batch, fleet_state) -> Plan`` with no I/O.

Modules:
    model      -- planning data types (jobs, GPU groups, fleet state, plans)
    evaluator  -- replays a plan exactly and scores it
    policies   -- the policies (fifo, min-evict, wspt, ...) as Policy objects in one registry
    api        -- plan(batch, state, policy), the entry point
"""
