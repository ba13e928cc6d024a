"""The queue cells: messages, delivery, alarms, dead letters."""
