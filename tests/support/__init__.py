"""What the tests share: cluster fixtures, model directories, simulators, tiny models and servers (no tests here)."""
