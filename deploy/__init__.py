"""deploy"""
