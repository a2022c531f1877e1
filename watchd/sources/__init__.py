"""Log watchers: kmsg, file-follow and a fake, all behind one interface and producing the same record."""
