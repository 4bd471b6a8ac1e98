"""replication"""
