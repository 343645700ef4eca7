"""Pages the project adds to the Airflow UI, served by the api-server through the plugin in
``plugins/``: the Models page (``models_page`` renders it, ``models_app`` serves it)."""
