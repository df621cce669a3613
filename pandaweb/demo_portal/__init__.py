"""The Acme Supplier Portal: an offline demo website for the browser robots to drive.

It is a separate, standard-library-only web server (see :mod:`pandaweb.demo_portal.server`); the
Django app exists only to provide the ``demo_portal`` management commands.
"""
