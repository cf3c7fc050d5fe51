"""The embedded database: an nx-27017 child process, supervised, with fixes for its storage
layer."""
