# <module> -> top -> mid -> leaf, burning CPU in leaf until killed.
# Lines marked "LINE:<name>" are where each frame is expected to be executing.
import sys
import threading  # some interpreters import it at start anyway: name the thread MainThread in all


def leaf():
    n = 0
    while True: n = (n * 31 + 7) % 1000003  # LINE:leaf


def mid():
    leaf()  # LINE:mid


def top():
    mid()  # LINE:top


print("ready", flush=True)
top()  # LINE:module
