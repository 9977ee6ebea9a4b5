# The phase timer without torch.inference_mode, as a library caller would run the engine (vanilla vs chain1):
# phase_timer_grad_mode.py COMPILE BATCH N_PROMPTS [T]
import os, pathlib, runpy, sys
os.environ["PHASE_TIMER_GRAD"] = "1"
sys.argv = [sys.argv[0], *sys.argv[1:5], "vanilla,chain1"] if len(sys.argv) > 4 else [sys.argv[0], *sys.argv[1:4], "0", "vanilla,chain1"]
runpy.run_path(str(pathlib.Path(__file__).with_name("phase_timer.py")), run_name="__main__")
