"""The process and the machine: environment record, memory and CPU accounts, CPU affinity, the machine probe."""
