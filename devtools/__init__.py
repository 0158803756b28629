"""Developer tools for tests and the demo: a real Kafka broker launcher and a MongoDB simulator.

Not shipped in the wheel.
"""
