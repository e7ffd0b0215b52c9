# Splits CPU 70/30 between two functions by fixed work: each round runs `seventy` 7 units and
# `thirty` 3 units of identical work.
import sys


def unit():
    n = 0
    for i in range(2000):
        n = (n * 31 + i) % 1000003
    return n


def seventy():
    for _ in range(7):
        unit()


def thirty():
    for _ in range(3):
        unit()


print("ready", flush=True)
while True:
    seventy()
    thirty()
