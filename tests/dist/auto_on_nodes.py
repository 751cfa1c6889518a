"""Run by tests/dist/test_torchrun_nodes.py under torchrun, on two agents that stand in for two
nodes, each agent's ranks reading their own folder of measured times (LESSON_CODE_RESULTS):
every rank runs the three collectives with "auto", and global rank 0 prints what each chose."""

import json

from lesson_code import launch

from own_tables import collectives_with_own_tables

if __name__ == "__main__":
    results = launch.run(collectives_with_own_tables, {})
    if launch.is_reporting_process():
        print("auto on nodes: " + json.dumps(results))
