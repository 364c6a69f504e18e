"""These tests run generated kernels: on the CPU in Triton's interpreter (set before any kernel is imported)."""

from tests.interpreter import switch_on

switch_on()
