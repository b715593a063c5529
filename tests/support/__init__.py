"""What the tests share and are not tests: helpers imported as `tests.support.<module>`, the library stand-ins
(exl2_standin, exl3_standin), recorded data (data/), and the paths to them (paths.py)."""
