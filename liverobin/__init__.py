"""liverobin"""
