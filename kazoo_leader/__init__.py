"""kazoo_leader"""
